CREATE TABLE IF NOT EXISTS picket_fence (
    resource      text    PRIMARY KEY CHECK (length(resource) BETWEEN 1 AND 512),
    lock_name     text    NOT NULL,
    strict_mode   boolean NOT NULL,
    highest_token bigint  NOT NULL CHECK (highest_token >= 0),
    last_seq      bigint,
    spent         boolean NOT NULL DEFAULT false
);

-- Decides a write under the admission rule and records it. Call it inside the transaction that
-- performs the write; roll back when it refuses. It trusts p_presented_lock and p_token: with
-- signed sequencers, verify the sequencer's signature in the caller before calling it.
CREATE OR REPLACE FUNCTION picket_fence_admit(
    p_resource text, p_lock text, p_strict boolean,
    p_presented_lock text, p_token bigint, p_seq bigint)
RETURNS TABLE (admitted boolean, reason text, highest_token bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    r picket_fence%ROWTYPE;
BEGIN
    IF p_resource IS NULL OR length(p_resource) NOT BETWEEN 1 AND 512 THEN
        RETURN QUERY SELECT false, 'invalid_resource'::text, 0::bigint; RETURN;
    END IF;
    IF p_token IS NULL OR p_token <= 0 THEN
        RETURN QUERY SELECT false, 'invalid_token'::text, 0::bigint; RETURN;
    END IF;
    INSERT INTO picket_fence (resource, lock_name, strict_mode, highest_token)
        VALUES (p_resource, p_lock, p_strict, 0)
        ON CONFLICT (resource) DO NOTHING;
    SELECT * INTO r FROM picket_fence f WHERE f.resource = p_resource FOR UPDATE;
    IF p_presented_lock IS DISTINCT FROM r.lock_name THEN
        RETURN QUERY SELECT false, 'wrong_lock'::text, r.highest_token; RETURN;
    END IF;
    IF p_token < r.highest_token THEN
        RETURN QUERY SELECT false, 'stale_token'::text, r.highest_token; RETURN;
    END IF;
    IF p_token > r.highest_token THEN
        UPDATE picket_fence f SET highest_token = p_token, last_seq = p_seq, spent = true
            WHERE f.resource = p_resource;
        RETURN QUERY SELECT true, 'advanced'::text, r.highest_token; RETURN;
    END IF;
    IF r.strict_mode THEN
        IF r.spent THEN
            RETURN QUERY SELECT false, 'strict_repeat'::text, r.highest_token; RETURN;
        END IF;
        UPDATE picket_fence f SET spent = true, last_seq = p_seq WHERE f.resource = p_resource;
        RETURN QUERY SELECT true, 'same'::text, r.highest_token; RETURN;
    END IF;
    IF p_seq IS NOT NULL AND r.last_seq IS NOT NULL AND p_seq <= r.last_seq THEN
        RETURN QUERY SELECT false, 'replayed_seq'::text, r.highest_token; RETURN;
    END IF;
    UPDATE picket_fence f SET last_seq = COALESCE(p_seq, r.last_seq) WHERE f.resource = p_resource;
    RETURN QUERY SELECT true, 'same'::text, r.highest_token;
END
$fn$;

-- Fence on acquire: makes p_token the highest unless a newer one was seen. Like
-- picket_fence_admit it trusts its caller: verify signed sequencers before calling it.
CREATE OR REPLACE FUNCTION picket_fence_register(
    p_resource text, p_lock text, p_strict boolean, p_presented_lock text, p_token bigint)
RETURNS TABLE (admitted boolean, reason text, highest_token bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    r picket_fence%ROWTYPE;
BEGIN
    IF p_resource IS NULL OR length(p_resource) NOT BETWEEN 1 AND 512 THEN
        RETURN QUERY SELECT false, 'invalid_resource'::text, 0::bigint; RETURN;
    END IF;
    IF p_token IS NULL OR p_token <= 0 THEN
        RETURN QUERY SELECT false, 'invalid_token'::text, 0::bigint; RETURN;
    END IF;
    INSERT INTO picket_fence (resource, lock_name, strict_mode, highest_token)
        VALUES (p_resource, p_lock, p_strict, 0)
        ON CONFLICT (resource) DO NOTHING;
    SELECT * INTO r FROM picket_fence f WHERE f.resource = p_resource FOR UPDATE;
    IF p_presented_lock IS DISTINCT FROM r.lock_name THEN
        RETURN QUERY SELECT false, 'wrong_lock'::text, r.highest_token; RETURN;
    END IF;
    IF p_token < r.highest_token THEN
        RETURN QUERY SELECT false, 'stale_token'::text, r.highest_token; RETURN;
    END IF;
    IF p_token > r.highest_token THEN
        UPDATE picket_fence f SET highest_token = p_token, last_seq = NULL, spent = false
            WHERE f.resource = p_resource;
    END IF;
    RETURN QUERY SELECT true, 'registered'::text, r.highest_token;
END
$fn$;
