SELECT Password, OAuthClientSecret FROM ChannelConfig WHERE Channel = ?1
