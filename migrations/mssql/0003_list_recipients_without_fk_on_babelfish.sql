-- On Babelfish only: NotificationListRecipients loses its foreign key to NotificationLists.
--
-- Babelfish 4.4 checks a foreign key with a cached query, and when a catalog invalidation
-- (any DDL on the server, e.g. another database being created) makes it plan that query again,
-- it plans it in the T-SQL dialect, which prefixes the already-qualified parent table with the
-- database name a second time: the INSERT of a list's targets then fails with
-- `relation "<db>_<db>_dbo.notificationlists" does not exist`, at random, while anything else
-- on the server changes its schema.
--
-- The statements keep the relation on their own (store/mssql/sql.rs): every writer of a list
-- changes its NotificationLists row first, so that row is the lock for its targets; a replace
-- writes the targets in the same transaction as the row, and a delete removes the row, then its
-- targets. SQL Server keeps the constraint (SERVERPROPERTY('babelfish') is NULL there).
IF CAST(SERVERPROPERTY('babelfish') AS int) = 1 AND OBJECT_ID(N'dbo.FK_NotificationListRecipients_List', N'F') IS NOT NULL
    ALTER TABLE dbo.NotificationListRecipients DROP CONSTRAINT FK_NotificationListRecipients_List;
