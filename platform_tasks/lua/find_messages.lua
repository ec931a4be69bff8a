-- Find the messages that hold a text (a job id, a correlation id) in queue lists, fair
-- lanes, the unacked hash and the delay store's entries, on the server: nothing but the
-- matches travels to the client. A job id is in every message's headers as Celery's task
-- id ("id"), a correlation id in its "argsrepr"; both are plain text in the wire JSON.
--
-- KEYS     lists and hashes to search (a missing key is skipped)
-- ARGV[1]  the text; ARGV[2] most matches to return; ARGV[3] items read per command
-- Returns  a flat array of (key, where, message): for a list, where is how many messages
--          are ahead of this one (0: the next one out, as BRPOP takes from the tail);
--          for a hash, the field (a delivery tag, a delay entry id).
local needle = ARGV[1]
local limit = tonumber(ARGV[2])
local chunk = tonumber(ARGV[3])
local found = {}
local matches = 0
local find = string.find

for _, key in ipairs(KEYS) do
    local kind = redis.call('TYPE', key)['ok']
    if kind == 'list' then
        local len = redis.call('LLEN', key)
        local start = 0
        while start < len do
            local items = redis.call('LRANGE', key, start, start + chunk - 1)
            for i = 1, #items do
                if find(items[i], needle, 1, true) then
                    found[#found + 1] = key
                    found[#found + 1] = tostring(len - start - i)
                    found[#found + 1] = items[i]
                    matches = matches + 1
                    if matches >= limit then return found end
                end
            end
            start = start + chunk
        end
    elseif kind == 'hash' then
        local cursor = '0'
        repeat
            local page = redis.call('HSCAN', key, cursor, 'COUNT', chunk)
            cursor = page[1]
            local pairs_ = page[2]
            for i = 1, #pairs_, 2 do
                if find(pairs_[i + 1], needle, 1, true) then
                    found[#found + 1] = key
                    found[#found + 1] = pairs_[i]
                    found[#found + 1] = pairs_[i + 1]
                    matches = matches + 1
                    if matches >= limit then return found end
                end
            end
        until cursor == '0'
    end
end
return found
