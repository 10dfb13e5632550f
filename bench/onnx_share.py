"""Do forked workers share an ONNX model's initializers? PSS of N children, each with its own
ONNX Runtime session, built four ways.

    python bench/onnx_share.py [--children 4] [--width 4096]

Graphs: the demo MLP (``bench/models.py`` ``mlp-onnx``: 512 x 512) and a bigger dense one
(three ``width x width`` float32 MatMuls, ``--width 4096``: 192 MiB of weights). Ways:

- ``path``: each child builds its session from the ``.onnx`` file (what a worker does today);
- ``bytes``: the parent reads the file before fork, each child builds from those bytes;
- ``ort-direct``: the parent reads the model converted to ORT format before fork; each child
  builds with ``session.use_ort_model_bytes_directly`` and
  ``session.use_ort_model_bytes_for_initializers`` (initializers point into those bytes);
- ``ort-mmap``: the same ORT file memory-mapped (``mmap``) by the parent before fork
  (this onnxruntime, 1.31, takes only ``str`` or ``bytes``: refused).

Each child runs 5 predicts of 64 rows (so the session's arena is in use), then the parent
sums the children's ``Pss`` (``/proc/<pid>/smaps_rollup``) and its own. Never a predict in
the parent. Prints the onnxruntime version and one row per graph and way.
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import select
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.models import model_path  # noqa: E402


def pss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise ValueError(pid)


def dense_graph(path: Path, width: int) -> Path:
    rng = np.random.default_rng(0)
    nodes, inits, name = [], [], "x"
    for i in range(3):
        w = numpy_helper.from_array(rng.standard_normal((width, width), dtype=np.float32), f"w{i}")
        inits.append(w)
        nodes.append(helper.make_node("MatMul", [name, f"w{i}"], [f"h{i}"]))
        name = f"h{i}"
    graph = helper.make_graph(
        nodes, "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, width])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None, width])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def to_ort(path: Path) -> Path:
    """The model in ORT format (the session's own serialisation), written by a subprocess:
    a session in this process would start thread pools its forked children lack."""
    import subprocess

    out = path.with_suffix(".ort")
    script = (
        "import onnxruntime as ort, sys\n"
        "o = ort.SessionOptions()\n"
        "o.optimized_model_filepath = sys.argv[2]\n"
        "o.add_session_config_entry('session.save_model_format', 'ORT')\n"
        "o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC\n"
        "ort.InferenceSession(sys.argv[1], o, providers=['CPUExecutionProvider'])\n"
    )
    subprocess.run([sys.executable, "-c", script, str(path), str(out)], check=True)
    return out


def child(source: object, direct: bool, width: int, ready_w: int) -> None:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    if direct:
        options.add_session_config_entry("session.use_ort_model_bytes_directly", "1")
        options.add_session_config_entry("session.use_ort_model_bytes_for_initializers", "1")
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])  # type: ignore[arg-type]
    name = session.get_inputs()[0].name
    x = np.random.default_rng(1).standard_normal((64, width), dtype=np.float32)
    for _ in range(5):
        session.run(None, {name: x})
    os.write(ready_w, b"1")
    signal.pause()


def describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.WEXITSTATUS(status)}"


def measure(source_of: dict[str, object], way: str, n: int, width: int) -> tuple[float, float]:
    """(children's total PSS, parent's PSS) in MiB."""
    source = source_of[way]
    read_r, ready_w = os.pipe()
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                child(source, way.startswith("ort"), width, ready_w)
            except BaseException as exc:
                os.write(ready_w, b"0")
                print(f"child: {type(exc).__name__}: {exc}"[:300], file=sys.stderr)
            finally:
                os._exit(0)
        pids.append(pid)
    got = b""
    while len(got) < n:
        if select.select([read_r], [], [], 1.0)[0]:
            got += os.read(read_r, n)
            continue
        for pid in pids:  # a child that died without a word (a crash in the session)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                for other in pids:
                    with contextlib.suppress(ProcessLookupError, ChildProcessError):
                        os.kill(other, signal.SIGKILL)
                        os.waitpid(other, 0)
                raise RuntimeError(f"a child died: {describe(status)}")
    if b"0" in got:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise RuntimeError("a child could not build its session")
    time.sleep(0.5)
    total = sum(pss_mib(p) for p in pids)
    parent = pss_mib(os.getpid())
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    os.close(read_r)
    os.close(ready_w)
    return total, parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=4)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--ways", nargs="+", choices=["path", "bytes", "ort-direct", "ort-mmap"])
    args = parser.parse_args()
    print(f"onnxruntime {ort.__version__}; {args.children} children")
    tmp = Path(tempfile.mkdtemp())
    graphs = {"mlp": (model_path("mlp-onnx"), 30), f"dense{args.width}": (
        dense_graph(tmp / "dense.onnx", args.width), args.width)}  # fmt: skip
    print("| graph | way | children PSS MiB | per child MiB | parent PSS MiB |")
    print("|---|---|---|---|---|")
    for graph, (path, width) in graphs.items():
        ort_path = to_ort(path)
        mapped = mmap.mmap(os.open(ort_path, os.O_RDONLY), 0, prot=mmap.PROT_READ)
        sources: dict[str, object] = {
            "path": str(path),
            "bytes": path.read_bytes(),
            "ort-direct": ort_path.read_bytes(),
            "ort-mmap": mapped,
        }
        for way in args.ways or sources:
            try:
                total, parent = measure(sources, way, args.children, width)
            except Exception as exc:  # an option this version refuses
                print(f"| {graph} | {way} | failed: {type(exc).__name__}: {exc} | | |")
                continue
            print(f"| {graph} | {way} | {total:,.0f} | {total / args.children:,.0f} |"
                  f" {parent:,.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
