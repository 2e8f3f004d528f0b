"""Records: the sweep folder (a point's folder, retries as data, resume, merged tables) and the
request statistics every launcher's rows are finished with."""
