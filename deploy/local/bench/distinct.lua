-- wrk script: every request a slug never asked before (custom-shaped, so it passes the scan
-- guard, and absent, so every tier looks it up to its source of truth and caches the miss):
-- fills the tiers' caches with DISTINCT_PREFIX-<thread>-<n> entries, to show that their
-- memory stays within the configured cache sizes.
local prefix = os.getenv("DISTINCT_PREFIX") or "zd"
local counter = 0
local id = 0
local threads = 0

setup = function(thread)
  threads = threads + 1
  thread:set("id", threads)
end

request = function()
  counter = counter + 1
  return wrk.format("GET", "/" .. prefix .. id .. "x" .. counter)
end

done = function(summary, latency, requests)
  io.write(string.format("RESULT requests=%d rps=%.0f p50_ms=%.3f p99_ms=%.3f max_ms=%.3f errors=%d\n",
    summary.requests, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
