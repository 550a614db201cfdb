-- Version 9: a priority cap per account (docs/quotas.md, "Priority cap"). max_priority is the
-- highest priority a user's job of the account may have (NULL: the default, 0); operators are
-- not capped. schema.sql's check_submission, applied with this migration, checks it and
-- max_pending in one read of the account's row, and replaces check_max_pending.
ALTER TABLE accounts ADD COLUMN IF NOT EXISTS max_priority bigint
    CHECK (max_priority BETWEEN -1000000 AND 1000000);
DROP FUNCTION IF EXISTS check_max_pending(text, bigint);
