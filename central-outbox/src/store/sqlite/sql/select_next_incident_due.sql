-- When the escalation clock is next due (IX_Incidents_Due).
SELECT MIN(NextDueAt) FROM Incidents WHERE NextDueAt IS NOT NULL
