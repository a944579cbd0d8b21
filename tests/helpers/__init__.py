# What the tests share: processes, fronts, builders.
