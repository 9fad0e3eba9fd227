"""The fault generator: model families x fault mechanisms x variations, each run with the verdict a
practitioner would give, to score the reasoner on runs nobody tuned it for.

``registry.cases(part)`` lists the runs; ``runner.run(case_id)`` makes one (watched by NeuralDbg) and
returns its verdict as plain data; ``runner.bite(case)`` checks, without NeuralDbg, that a fault
really harms its run; ``score`` turns the outcomes into the scoreboard.
"""
