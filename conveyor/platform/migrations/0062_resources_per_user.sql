-- A resource's id is its user's own: (user_id, id) is a resource's identity, as (user, message id)
-- already was for a client-chosen message. Before, ids were one namespace: a PUT of another user's
-- id answered 404 where a free one answered 202 (telling a stranger the id exists), and an id taken
-- first locked its owner out of it. The indexed chunks carry the user with the resource's id.

ALTER TABLE resource_chunks ADD COLUMN user_id TEXT;
UPDATE resource_chunks c SET user_id = r.user_id FROM resources r WHERE r.id = c.resource_id;
ALTER TABLE resource_chunks ALTER COLUMN user_id SET NOT NULL;

ALTER TABLE resource_chunks DROP CONSTRAINT resource_chunks_resource_id_fkey;
ALTER TABLE resource_chunks DROP CONSTRAINT resource_chunks_pkey;
ALTER TABLE resources DROP CONSTRAINT resources_pkey;

ALTER TABLE resources ADD PRIMARY KEY (user_id, id);
ALTER TABLE resource_chunks ADD PRIMARY KEY (user_id, resource_id, seq);
ALTER TABLE resource_chunks ADD FOREIGN KEY (user_id, resource_id) REFERENCES resources (user_id, id) ON DELETE CASCADE;

-- An index job enqueued before this migration names the id alone: it finds the resource by id.
CREATE INDEX resources_by_id ON resources (id, created_at);
