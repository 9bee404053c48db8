-- Each incident of an escalation turn fires inside a savepoint of its own: one whose stored data
-- cannot be fired is rolled back and set aside without undoing the others' pages.
SAVEPOINT fire_incident
