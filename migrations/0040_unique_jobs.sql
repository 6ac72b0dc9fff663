-- Unique jobs (issue 24): enqueue `unique: {key?, for_seconds?, while?}` (docs/producers.md).
--
-- A unique job carries its key, the start of the window it was enqueued in ('-infinity': no window, the key
-- holds for as long as such a job exists), the window's length, and the states in which it holds the key.
-- jobs_unique_idx (0041) is unique over (queue, key, window start) for the rows whose status is one of their
-- own unique_states: a job leaves the index, and frees its key, when it moves to a state outside its list or
-- when retention deletes it. An expired window needs no cleanup: the next enqueue falls in a later window,
-- a different index key.
-- Columns nullable without defaults: metadata-only changes, no scan of a big table under its lock.
ALTER TABLE jobs ADD COLUMN unique_key text;
ALTER TABLE jobs ADD COLUMN unique_from timestamptz;
ALTER TABLE jobs ADD COLUMN unique_for_seconds integer;
ALTER TABLE jobs ADD COLUMN unique_states text[];
