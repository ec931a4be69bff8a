-- Find the messages that hold a text (a job id, a correlation id) in queue lists, fair
-- lanes, the unacked hash and the delay store's entries, on the server: nothing but the
-- matches travels to the client. A job id is in every message's headers as Celery's task
-- id ("id"), a correlation id in its "argsrepr"; both are plain text in the wire JSON.
--
-- Reading a message into Lua costs far more than Redis's own C loops (LPOS), so a job id
-- that carries its time (the platform's UUIDv7 ids) is looked for first where it should
-- be: lists are pushed at the head in publish order, so a bisection over the ids' times
-- (LINDEX, one message read per step) finds the spot and only a window around it is read
-- (a narrow one in every list, then a wide one).
-- Only when that fails (a retry re-entered a list out of order, an id without a time) are
-- the hashes and then every list read in full.
--
-- Each message read is tested first for the anchor, the text's part from a character a
-- base64 body lacks ('=' before a correlation id, '-' of a job id): string.find looks for
-- its first character with memchr, which then crosses the body (most of a message) in one
-- call instead of stopping at every 'c' in it; the whole text is checked only where the
-- anchor is found. That took the correlation search from 1.7-1.9x the bare read of the
-- messages to 0.9-1.3x; for a job id it changed nothing measurable (BENCHMARKS.md, "Job
-- status"). The read itself (Redis copying each message into Lua) is most of the time.
--
-- KEYS     lists and hashes to search (a missing key is skipped)
-- ARGV[1]  the text; ARGV[2] its anchor (a suffix of it); ARGV[3] most matches to return;
-- ARGV[4]  items read per command; ARGV[5] the job id's time in ms ('' to skip the
-- bisection); ARGV[6] window half-width
-- Returns  a flat array of (key, where, message): for a list, where is how many messages
--          are ahead of this one (0: the next one out, as BRPOP takes from the tail);
--          for a hash, the field (a delivery tag, a delay entry id).
local needle = ARGV[1]
local anchor = ARGV[2]
local whole = anchor == needle
local limit = tonumber(ARGV[3])
local chunk = tonumber(ARGV[4])
local target = tonumber(ARGV[5])
local window = tonumber(ARGV[6]) or 0
local NARROW = 16
local find = string.find
local found = {}
local matches = 0

local function add(key, where, item)
    found[#found + 1] = key
    found[#found + 1] = where
    found[#found + 1] = item
    matches = matches + 1
    return matches >= limit
end

-- read indexes first..last of a list; true once the limit is reached
local function scan_range(key, len, first, last)
    local start = first
    while start <= last do
        local stop = math.min(start + chunk - 1, last)
        local items = redis.call('LRANGE', key, start, stop)
        for i = 1, #items do
            local item = items[i]
            if find(item, anchor, 1, true) and (whole or find(item, needle, 1, true)) then
                if add(key, tostring(len - start - i), item) then return true end
            end
        end
        start = stop + 1
    end
    return false
end

-- the time (ms) of the UUIDv7 job id of the message at index, or nil
local function time_at(key, index)
    local item = redis.call('LINDEX', key, index)
    if not item then return nil end
    local high, low = string.match(item, '"id": ?"(%x%x%x%x%x%x%x%x)%-(%x%x%x%x)%-7')
    if not high then return nil end
    return tonumber(high .. low, 16)
end

-- bisect a list (newest at index 0) for the first message not newer than the target
local function near(key, len)
    local lo, hi = 0, len - 1
    while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        local t = time_at(key, mid)
        if t == nil then return nil end
        if t > target then lo = mid + 1 else hi = mid end
    end
    return lo
end

local kinds = {}
for i, key in ipairs(KEYS) do
    kinds[i] = redis.call('TYPE', key)['ok']
end

if target then
    -- a narrow window in every list first (where the job almost always is), then wide
    local spots = {}
    for i, key in ipairs(KEYS) do
        if kinds[i] == 'list' then
            local len = redis.call('LLEN', key)
            local at = near(key, len)
            if at ~= nil then
                spots[#spots + 1] = {key, len, at}
                local first = math.max(0, at - NARROW)
                local last = math.min(len - 1, at + NARROW)
                if scan_range(key, len, first, last) then return found end
            end
        end
    end
    if matches > 0 then return found end
    for _, spot in ipairs(spots) do
        local key, len, at = spot[1], spot[2], spot[3]
        local first = math.max(0, at - window)
        local last = math.min(len - 1, at + window)
        if scan_range(key, len, first, last) then return found end
    end
    if matches > 0 then return found end
end

for i, key in ipairs(KEYS) do
    if kinds[i] == 'hash' then
        local cursor = '0'
        repeat
            local page = redis.call('HSCAN', key, cursor, 'COUNT', chunk)
            cursor = page[1]
            local pairs_ = page[2]
            for j = 1, #pairs_, 2 do
                local item = pairs_[j + 1]
                if find(item, anchor, 1, true) and (whole or find(item, needle, 1, true)) then
                    if add(key, pairs_[j], pairs_[j + 1]) then return found end
                end
            end
        until cursor == '0'
    end
end

for i, key in ipairs(KEYS) do
    if kinds[i] == 'list' then
        local len = redis.call('LLEN', key)
        if scan_range(key, len, 0, len - 1) then return found end
    end
end
return found
