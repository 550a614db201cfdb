-- Version 5: accounts (docs/accounts.md). Every job records the account that submitted it (jobs
-- stored before are 'anonymous'), and every change a caller makes is written to the audit trail
-- in its own statement.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS owner text NOT NULL DEFAULT 'anonymous';
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs (owner, id);

CREATE TABLE IF NOT EXISTS audit_log (
    id          bigserial   PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    role        text        NOT NULL,
    actor_id    text        NOT NULL,
    account     text        NOT NULL,
    address     text        NOT NULL,
    action      text        NOT NULL
                CHECK (action IN ('submit', 'cancel', 'drain', 'cordon', 'uncordon')),
    target_ids  jsonb       NOT NULL DEFAULT '[]',
    arguments   jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS audit_log_by_account ON audit_log (account, id);
CREATE INDEX IF NOT EXISTS audit_log_by_time ON audit_log (at);
