-- The changes the site stored, their seqs a JSON array (one statement for a whole batch).
DELETE FROM SiteStatusFeed WHERE SiteId = ?1 AND Seq IN (SELECT value FROM json_each(?2))
