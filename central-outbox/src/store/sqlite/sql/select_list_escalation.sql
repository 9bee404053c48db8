-- A list's escalation policy (JSON, store/stored_policy.rs), read once per list and batch by
-- the submit that may open incidents for it.
SELECT Escalation FROM NotificationLists WHERE Name = ?1
