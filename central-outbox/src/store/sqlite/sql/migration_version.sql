SELECT COALESCE(MAX(Version), 0) FROM SchemaMigrations
