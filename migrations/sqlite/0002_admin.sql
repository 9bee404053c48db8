-- Operator actions join the delivery attempts in one audit history per notification.
-- NotificationAttempts.AttemptNo is the entry's sequence number in that history, and
-- Notifications.AttemptCount counts entries of every kind (delivery attempts and operator
-- actions), so an action and an attempt never share a number. Operator entries have Outcome
-- 'OperatorRetry' or 'OperatorDiscard', no LeaseEpoch, and the operator in Actor.
ALTER TABLE NotificationAttempts ADD COLUMN Actor TEXT;

-- QueryNotifications filtered by status (the common "show me what is parked"), newest first.
CREATE INDEX IX_Notifications_Status_Created ON Notifications (Status, CreatedAt DESC, Id DESC);
