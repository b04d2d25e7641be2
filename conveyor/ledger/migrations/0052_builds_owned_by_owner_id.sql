-- Which user a build belongs to is builds.owner_id (the API sets it to the
-- key's user), so the separate build_owners table of 0050 is not needed.
DROP TABLE build_owners;
