"""What every dynamic provider here shares, and nothing else: the `Change` a plan returns
(`change`), the class each package's provider subclasses (`provider_base`: `NodeResourceProvider`
and the package's `Verbs`), the fan-out of copies across nodes (`fan_out_tree`), the progress lines
a long step prints (`progress`), and a node program run and its one JSON report read off its stdout
(`reports`: `run_program`, `read_report`, `require_report`). No import of any resource package:
each resource imports these."""
