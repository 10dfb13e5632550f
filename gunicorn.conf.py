"""Gunicorn settings for serving: ``gunicorn wsgi:app -c gunicorn.conf.py``.

Values come from SERVING_* environment variables (see README); Gunicorn's own command
line flags still win (``--workers 4``). The hooks only call into ``serving.server.hooks``.
"""

from serving.server import hooks

settings = hooks.settings_or_exit()

bind = settings.bind
# Our own gthread worker (serving/server/worker.py): one worker holds many requests in
# flight, so its batcher can merge them; request heads are read on its main loop, so idle
# and slow connections hold no thread.
worker_class = "serving.server.worker.ServingWorker"
# Connections a worker holds open, idle ones included (Gunicorn's default is 1,000); the
# worker raises its open-files limit to match, as far as the hard limit allows.
worker_connections = 4096
workers = settings.workers
threads = settings.worker_threads
timeout = settings.timeout_s
graceful_timeout = settings.drain_timeout_s
max_requests = settings.max_requests
max_requests_jitter = settings.max_requests_jitter
keepalive = 5
loglevel = settings.log_level
# Never preload the app (Flask, the metrics, the batcher threads). The model is another
# matter: with SERVING_SHARE_MODEL=auto the when_ready and on_reload hooks load pickle,
# joblib and skops models in the master, without predicting, so workers share one copy;
# ONNX sessions and your own classes load in each worker after fork, because ONNX Runtime
# and BLAS thread pools do not survive fork() (see serving/server/sharing.py).
preload_app = False
# Gunicorn 25+ opens a control socket at one per-user path (~/.gunicorn/gunicorn.ctl): a
# second server on the host would take it over, and it can resize or stop the server.
# Kubernetes, systemd and signals manage this service; delete this line to have one
# anyway.
control_socket_disable = True
# Its error log on stderr drops lines instead of blocking when nobody reads the pipe
# (serving/server/error_log.py): a blocked master handles no signal.
logger_class = "serving.server.error_log.NonBlockingLogger"

hooks.prepare_metrics_dir(settings)


def on_starting(server):
    hooks.on_starting(server)


def when_ready(server):
    hooks.when_ready(server, settings)


def on_reload(server):
    hooks.on_reload(server, settings)


def pre_exec(server):
    hooks.pre_exec(server)


def pre_fork(server, worker):
    hooks.pre_fork(server, worker)


def post_fork(server, worker):
    hooks.post_fork(server, worker, settings)


def post_worker_init(worker):
    hooks.post_worker_init(worker)


def worker_exit(server, worker):
    hooks.worker_exit(server, worker, settings)


def child_exit(server, worker):
    hooks.child_exit(server, worker)


def on_exit(server):
    hooks.on_exit(server)
