-- The record of applied migrations, created before anything else reads it.
CREATE TABLE IF NOT EXISTS SchemaMigrations (
    Version   INTEGER PRIMARY KEY,
    Name      TEXT    NOT NULL,
    AppliedAt INTEGER NOT NULL
)
