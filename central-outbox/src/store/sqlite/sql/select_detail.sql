SELECT Body, TypeData, SourceInstanceId, SourceScript, OriginExecutionId,
       OriginParentExecutionId, ResolvedTargets
FROM Notifications WHERE Id = ?1
