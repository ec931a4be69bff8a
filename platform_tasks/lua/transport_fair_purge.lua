-- Empty queue lists and their tenant lanes in one step; returns the messages removed.
--
-- KEYS[6(i-1) + 1..6] for list i: the queue list (the arrival list), the ring, the turn
--          count, the waiting count, the lane lengths and the lane heads
--          (fair_lane_parts.lua)
-- ARGV[i]  the prefix of list i's lane keys
--
-- One script, so no sort runs between reading which tenants have lanes and deleting
-- them: read and deleted by separate commands, a sort in between could put a new
-- tenant on the ring after it was read, and that tenant's lane outlived the ring.
-- Lanes are found on the ring and in the lengths set (the same tenants, unless an
-- earlier release left them apart).
local removed = 0
for i = 1, #ARGV do
  local k = 6 * (i - 1)
  local arrivals, ring, prefix = KEYS[k + 1], KEYS[k + 2], ARGV[i]
  removed = removed + redis.call('LLEN', arrivals)
  redis.call('DEL', arrivals)
  local seen = {}
  local tenants = redis.call('LRANGE', ring, 0, -1)
  for _, tenant in ipairs(redis.call('ZRANGE', KEYS[k + 5], 0, -1)) do
    tenants[#tenants + 1] = tenant
  end
  for _, tenant in ipairs(tenants) do
    if not seen[tenant] then
      seen[tenant] = true
      local lane = prefix .. tenant
      removed = removed + redis.call('LLEN', lane)
      redis.call('DEL', lane)
    end
  end
  for j = 2, 6 do
    redis.call('DEL', KEYS[k + j])
  end
end
return removed
