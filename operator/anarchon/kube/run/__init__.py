"""A run of an AnarchonJob on the Kubernetes side, one room per concern, bottom up:

* :mod:`.record`: the AnarchonRun object, and the only module that reads or writes its status;
* :mod:`.cache`: every AnarchonRun of the replica's scope, kept by one watch;
* :mod:`.replaced`: ending a run replaced by a newer one (overlap Replace);
* :mod:`.held`: one attempt's hold on its run, what every step below works with;
* :mod:`.pending`: the pending watchdog;
* :mod:`.follow`: following a try's Pod to its end;
* :mod:`.tries`: the current try, adopting or launching its Pod, the backoff after a failed one;
* :mod:`.overlap`: Skip and Replace by what runs;
* :mod:`.runner`: the engine's handler, which takes an attempt through the rooms above.

A module imports only the ones listed before it (none imports the runner).
"""
