-- The dispatcher's statements as stored procedures: this migration created
-- dbo.ClaimDueNotifications, dbo.RecordAttemptOutcomes and dbo.AcquireLease. Each now lives in
-- a file of its own under procedures/ (ClaimDueNotifications.sql, RecordAttemptOutcomes.sql,
-- AcquireLease.sql), which the migrator creates again whenever the file changes (README.md
-- here); what stays in this migration is the schema they need.

-- Which rows a claim took, without OUTPUT: each claim stamps its rows with a token of its own.
IF COL_LENGTH(N'dbo.Notifications', N'ClaimToken') IS NULL
    ALTER TABLE dbo.Notifications ADD ClaimToken uniqueidentifier NULL;
GO
