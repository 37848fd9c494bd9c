-- sangho-bench's wrk script: posts signed Sangho events. Signing in Lua
-- would cost wrk CPU, so sangho-bench signs them beforehand and writes
-- a data file (args[1]): line 1 the body before the event ID, line 2
-- the body after it, then one line per event, "w ID SIG" for the events
-- already sent (warm-up: what redeliveries draw from at first) and
-- "n ID SIG" for new ones, each sent once. args[2] is the share of
-- requests that redeliver a recent event (0..1).
--
-- Every request is built here, in init, before the run: a request made
-- while it runs is a new string of the body's size for LuaJIT to hash,
-- allocate and collect, which cost wrk 3-4 times the CPU of one it
-- made before (an event sent again), and wrk shares the cores with
-- Caddy. Built beforehand, a request is a copy into the connection's
-- buffer, new or not, so the sites of a comparison get about the same
-- CPU. init_cpu (seconds of process CPU when init ends) lets
-- sangho-bench leave that building out of wrk's CPU, and the line
-- SANGHO_BENCH_READY tells it when the load starts.
local prefix, suffix
local fresh, recent = {}, {}
local dup, rpos = 0, 0
used = 0       -- new events sent; read by done() through thread:get
exhausted = 0  -- requests that found no new event left (wrapped around)
init_cpu = 0   -- process CPU in seconds when init ended

-- build is the whole request of event id signed sig, as wrk.format
-- would make it, in one concatenation: one string of the request's size,
-- no body string left behind for the collector (init keeps the whole
-- run's requests in memory at once).
local function build(id, sig)
	return "POST " .. wrk.path .. " HTTP/1.1\r\nHost: " .. wrk.headers["Host"] ..
		"\r\nContent-Type: application/json\r\nContent-Length: " .. (#prefix + #id + #suffix) ..
		"\r\nSangho-Event-ID: " .. id .. "\r\nSangho-Signature: " .. sig .. "\r\n\r\n" ..
		prefix .. id .. suffix
end

-- verifying: wrk calls request() once after init to see what it sends,
-- before the run (script_verify_request, for its first thread; this
-- script runs with one). That request is never sent: it must not use a
-- new event up, nor count, nor become a redelivery.
local verifying = false

function init(args)
	local f = assert(io.open(args[1], "r"))
	prefix = f:read("*l")
	suffix = f:read("*l")
	for line in f:lines() do
		local kind, id, sig = line:match("^(%a) (%S+) (%S+)$")
		if kind == "w" then
			recent[#recent + 1] = build(id, sig)
		elseif kind == "n" then
			fresh[#fresh + 1] = build(id, sig)
		end
	end
	f:close()
	dup = tonumber(args[2] or "0")
	math.randomseed(os.time())
	collectgarbage("collect")
	verifying = true
	init_cpu = os.clock()
	-- The load starts now: sangho-bench starts its CPU count of Caddy
	-- (and its profile) here, not while it signed or this built.
	io.write("SANGHO_BENCH_READY\n")
	io.stdout:flush()
end

local function remember(e)
	if #recent < 256 then
		recent[#recent + 1] = e
	else
		rpos = rpos % 256 + 1
		recent[rpos] = e
	end
end

function request()
	if verifying then
		verifying = false
		return fresh[1] or recent[1]
	end
	local e
	if dup > 0 and #recent > 0 and math.random() < dup then
		e = recent[math.random(#recent)]
	else
		used = used + 1
		e = fresh[used]
		if e == nil then
			exhausted = exhausted + 1
			e = fresh[(used - 1) % #fresh + 1]
		end
		remember(e)
	end
	return e
end

local threads = {}

function setup(thread)
	threads[#threads + 1] = thread
end

function done(summary, latency, requests)
	local u, x, c = 0, 0, 0
	for _, t in ipairs(threads) do
		u = u + t:get("used")
		x = x + t:get("exhausted")
		c = math.max(c, t:get("init_cpu"))
	end
	local e = summary.errors
	io.write(string.format("SANGHO_BENCH requests=%d duration_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d fresh_used=%d exhausted=%d init_cpu_us=%d\n",
		summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
		latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, u, x, c * 1e6))
end
