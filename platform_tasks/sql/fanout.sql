-- name: default_tenants
-- The default tenant source: the active rows of core.tenants.
SELECT tenant_id, freshness_tier FROM core.tenants WHERE active

-- name: load_progress
-- Where an earlier delivery of this fan-out job stopped (no row: it never published).
SELECT last_tenant_id, published, finished_at FROM core.fanout_progress WHERE job_id = %s

-- name: start_progress
-- Record a fan-out job before it publishes; a rerun keeps the existing marker.
INSERT INTO core.fanout_progress (job_id, job_name, point, kind)
VALUES (%s, %s, %s, %s)
ON CONFLICT (job_id) DO NOTHING

-- name: save_progress
-- After each published batch: the last tenant on the queue and the running count.
UPDATE core.fanout_progress
   SET last_tenant_id = %s, published = %s, updated_at = now()
 WHERE job_id = %s

-- name: finish_progress
-- The fan-out published every tenant.
UPDATE core.fanout_progress SET finished_at = now(), updated_at = now() WHERE job_id = %s

-- name: purge_progress
-- Markers of finished fan-outs older than the idempotency rows they stand beside.
DELETE FROM core.fanout_progress WHERE finished_at < now() - make_interval(days => %s)

-- name: stream_tenants
-- Tenants after the first parameter (exclusive; '' for all) in tenant_id order, only the
-- tiers in the array given as second and third parameter (NULL: every tier). The
-- placeholder in braces is the tenants query (the default source or
-- PLATFORM_TENANTS_QUERY), used as a subquery; read with a named cursor.
SELECT tenant_id::text, freshness_tier::text
  FROM ({source}
       ) AS tenants
 WHERE tenant_id::text > %s
   AND (%s::text[] IS NULL OR freshness_tier::text = ANY(%s::text[]))
 ORDER BY tenant_id::text

-- name: check_tenants
-- Start-up check of the tenants query: its columns, no rows read.
SELECT * FROM ({source}
) AS tenants LIMIT 0
