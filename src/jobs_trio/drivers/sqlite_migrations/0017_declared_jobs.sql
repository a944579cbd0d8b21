-- The jobs each worker's registry declares, with their queue and attempts (issue 46): what
-- `jobs-trio enqueue` checks a job's name against without importing the application (a typo is
-- refused, naming the close matches) and where it finds the declared queue. A JSON array of
-- [name, queue, attempts]; NULL from a worker of a release before it.

ALTER TABLE workers ADD COLUMN jobs TEXT;
