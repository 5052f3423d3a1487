"""`python -m appliance` is the `autotune` command."""

from appliance.cli import main

main()
