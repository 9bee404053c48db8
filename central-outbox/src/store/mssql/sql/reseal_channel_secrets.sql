SET XACT_ABORT ON;
SET NOCOUNT ON;
UPDATE c
SET c.Password = CASE WHEN c.Password = @P2 THEN @P3 ELSE c.Password END,
    c.OAuthClientSecret = CASE WHEN c.OAuthClientSecret = @P4 THEN @P5 ELSE c.OAuthClientSecret END
FROM dbo.ChannelConfig AS c
WHERE c.Channel = @P1;
