SET XACT_ABORT ON;
SET NOCOUNT ON;
EXEC dbo.AcknowledgeIncident @Id = @P1, @Status = @P2, @PageCount = @P3, @NextDueAt = @P4, @Actor = @P5, @Means = @P6, @From = @P7, @ReminderMs = @P8, @Rest = @P9;
