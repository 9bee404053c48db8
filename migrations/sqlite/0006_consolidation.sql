-- Flood consolidation, opt-in per list (central's domain::consolidation). A list that sets it
-- holds the notifications that arrive over its threshold within one window (status Held, due at
-- the window's end) and sends them as digests; each keeps its own row and history.

-- The list's settings: all three set, or none (no consolidation).
ALTER TABLE NotificationLists ADD COLUMN ConsolidateThreshold INTEGER;
ALTER TABLE NotificationLists ADD COLUMN ConsolidateWindowSeconds INTEGER;
ALTER TABLE NotificationLists ADD COLUMN ConsolidateMaxPerDigest INTEGER;

-- How many notifications arrived for a list in its current window (one row per list: a row
-- from an earlier window starts again at 1), counted in the submit's transaction, so every
-- replica counts the same arrivals once.
CREATE TABLE ConsolidationWindows (
    ListName    TEXT    PRIMARY KEY,
    WindowStart INTEGER NOT NULL,
    Arrived     INTEGER NOT NULL
);

-- The attempt of a notification sent in a digest names the digest (its id: the mail's
-- Message-ID, the webhook's Idempotency-Key).
ALTER TABLE NotificationAttempts ADD COLUMN DigestId TEXT;

-- The digest claim: held rows of one channel by due time (the end of their window, or the
-- retry time after a failed digest), then those of the first one's list.
CREATE INDEX IX_Notifications_Held ON Notifications (Type, NextAttemptAt, Id)
    WHERE Status = 'Held';
CREATE INDEX IX_Notifications_Held_List ON Notifications (Type, ListName, NextAttemptAt, Id)
    WHERE Status = 'Held';

-- A held row can be superseded and cleared like the other waiting ones.
DROP INDEX IX_Notifications_Condition;
CREATE INDEX IX_Notifications_Condition
    ON Notifications (SourceSiteId, ConditionKey, ListName, SiteEnqueuedAt)
    WHERE Status IN ('Pending', 'Retrying', 'Held') AND ConditionKey IS NOT NULL;
