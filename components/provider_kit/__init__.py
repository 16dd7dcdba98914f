"""What every dynamic provider here shares, and nothing else: the `Change` a plan returns
(`change`), the fan-out of copies across nodes (`copy_plan`), and the progress lines a long step
prints (`progress`). Pure, and no import of any resource package: each resource imports these."""
