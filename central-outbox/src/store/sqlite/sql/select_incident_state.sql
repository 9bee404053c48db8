-- What an acknowledgement needs to know of its incident.
SELECT Status, AcknowledgedBy, AcknowledgedVia, AcknowledgedAt, EndedAt, Policy, ConditionKey
FROM Incidents WHERE Id = ?1
