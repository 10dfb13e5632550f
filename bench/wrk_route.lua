-- wrk script: POST one body (read from a file) to one path, keep-alive.
-- Usage: wrk ... -s bench/wrk_route.lua URL -- PATH BODY_FILE CONTENT_TYPE
-- Prints one JSON line at the end, as bench/wrk_predict.lua does.
local path, body, content_type = "/", "", "application/json"

function init(args)
  path, content_type = args[1], args[3] or "application/json"
  local f = io.open(args[2], "rb")
  body = f:read("*a")
  f:close()
end

function request()
  return wrk.format("POST", path, { ["Content-Type"] = content_type }, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "seconds": %.6f, "errors": %d, "status_errors": %d, "p50_us": %d}\n',
    summary.requests, summary.duration / 1e6, e.connect + e.read + e.write + e.timeout,
    e.status, latency:percentile(50)))
end
