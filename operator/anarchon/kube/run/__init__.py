"""A run of an AnarchonJob on the Kubernetes side, one room per concern, bottom up:

* :mod:`.workload`: what a run's Pod is told about its run (environment, fencing token);
* :mod:`.pods`: a run's Pods: built from the template, found again, their fate read;
* :mod:`.podwatch`: the replica's one watch on its Pods, which wakes their runners;
* :mod:`.runstatus`: a run's status, typed (:class:`.runstatus.RunStatus`): the only module
  that reads its fields or says how they change;
* :mod:`.record`: the AnarchonRun object: created, its status changes written (guarded), read back;
* :mod:`.cache`: every AnarchonRun of the replica's scope, kept by one watch;
* :mod:`.replaced`: ending a run replaced by a newer one (overlap Replace);
* :mod:`.mend`: a run left open after the store ended it, made to say how it ended;
* :mod:`.held`: one attempt's hold on its run, what every step below works with;
* :mod:`.pending`: the pending watchdog;
* :mod:`.follow`: following a try's Pod to its end;
* :mod:`.tries`: the current try, adopting or launching its Pod, the backoff after a failed one;
* :mod:`.overlap`: Skip and Replace by what runs;
* :mod:`.runner`: the engine's handler, which takes an attempt through the rooms above;
* :mod:`.listener`: the engine's listener: what it reports, as metrics, Events and AnarchonRuns.

A module imports only the ones listed before it (none imports the runner), and of the rest of
``kube`` only ``api``, ``job.spec`` and ``report`` (``tests/kube/test_layers.py``).
"""
