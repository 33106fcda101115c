"""`gpuval fleet`: many nodes' result.json in one verdict, read the way a Slurm array or an Indexed Job
leaves them (one folder per node).

    read.py      result files -> one record per node of each run (the checks that did not pass, the values
                 compared across the fleet); the --expect list
    judge.py     the newest run of each node counts; nodes against each other by median and MAD; the drain
                 list, the nodes to run again, the exit code
    hostlist.py  Slurm's hostlist syntax, both ways
    document.py  fleet.json (gpuval.fleet/v1) and its JSON Schema
    html.py      fleet.html;  junit.py  junit.xml;  write.py  the three, each written atomically

The console table is gpuval.cli.fleet's (rich is drawn only in cli/ and report/).
"""
