"""Tests against a real PostgreSQL: the suite's server (``TEST_DATABASE_URL`` or an embedded one)
and what runs on it, in-process workers and real ``miniqueue-supervise`` process trees."""
