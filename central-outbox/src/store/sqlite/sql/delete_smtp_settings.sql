DELETE FROM ChannelConfig WHERE Channel = ?1
