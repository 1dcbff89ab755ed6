-- wrk script: GET a random slug from the file named by SLUGS_FILE on every request. `errors`
-- counts failed connections, reads, writes, timeouts and answers with a status >= 400 (wrk's
-- own tally: a per-response Lua callback would cost more than the servers being measured).
local slugs = {}
local path = os.getenv("SLUGS_FILE")
for line in io.lines(path) do
  if #line > 0 then slugs[#slugs + 1] = "/" .. line end
end
math.randomseed(os.time())

request = function()
  return wrk.format("GET", slugs[math.random(#slugs)])
end

done = function(summary, latency, requests)
  io.write(string.format("RESULT requests=%d rps=%.0f p50_ms=%.3f p99_ms=%.3f max_ms=%.3f errors=%d\n",
    summary.requests, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout + summary.errors.status))
end
