"""Programs that tests run in a child process (``helpers.run_program(NAME, ...)``): each module
has a docstring saying what it does and a ``main(argv)``, and prints its result as JSON when it
has one."""
