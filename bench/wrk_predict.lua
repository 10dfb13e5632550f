-- wrk script: POST /predict cycling through single-instance bodies of real rows.
-- Usage: wrk ... -s bench/wrk_predict.lua URL -- BODIES_FILE [close]
-- Prints one JSON line at the end: requests, seconds, errors, latency percentiles in us.
local bodies = {}
local index = 0
local close = false

function init(args)
  for line in io.lines(args[1]) do
    bodies[#bodies + 1] = line
  end
  close = args[2] == "close"
end

function request()
  index = index % #bodies + 1
  local headers = { ["Content-Type"] = "application/json" }
  if close then headers["Connection"] = "close" end
  return wrk.format("POST", "/predict", headers, bodies[index])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "seconds": %.6f, "connect_errors": %d, "read_errors": %d, ' ..
    '"write_errors": %d, "status_errors": %d, "timeouts": %d, ' ..
    '"p50_us": %d, "p95_us": %d, "p99_us": %d}\n',
    summary.requests, summary.duration / 1e6, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
