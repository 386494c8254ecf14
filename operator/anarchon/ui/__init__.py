"""``anarchon ui``: a local web page of the jobs, a timeline of their runs and each run's story.

One module per concern: :mod:`.model` keeps the objects live (the operator's list-then-watch
loop, :mod:`anarchon.kube.api.watching`), :mod:`.pages` turns them into HTML with the CLI's own
records (:mod:`anarchon.cli.records`), :mod:`.timeline` draws the runs in SVG, :mod:`.words`
says a schedule in words, :mod:`.actions` acts with the user's credentials, :mod:`.server`
serves it all on loopback and pushes changes to open pages as server-sent events.
"""
