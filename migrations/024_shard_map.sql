-- Several databases (see "Several databases" in README.md): this database's place in a shard
-- map, recorded when it joins one (`miniqueue migrate --shards`). One row at most: its name and
-- index in the map. From then on its job ids are drawn from 2^52 up, each with the index as its
-- residue modulo 1024 (the id sequence's increment and start, set when it joins), so that an id
-- names its database and no two databases of a map can draw the same one.
CREATE TABLE miniqueue_shard (
    only_row  BOOLEAN     PRIMARY KEY DEFAULT true CHECK (only_row),
    name      TEXT        NOT NULL,
    idx       INT         NOT NULL CHECK (idx >= 0 AND idx < 1024),
    joined_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
