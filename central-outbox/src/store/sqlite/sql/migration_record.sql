INSERT INTO SchemaMigrations (Version, Name, AppliedAt) VALUES (?1, ?2, ?3)
