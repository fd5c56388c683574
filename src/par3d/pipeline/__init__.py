"""Pipeline parallelism.  schedules, partition and simulate are pure (no torch);
`runtime` imports torch and is therefore not imported here."""
