"""``kvtier bench faults``: the fault campaign at random; its parts serve the engine tests too.

command  its arguments     run  the campaign at random (a hypothesis state machine)
campaign  Campaign: prompts, references, engines     engine  CampaignEngine: passes, cases
setting  Setting, Case     tiers  faults put in a disk or Redis tier     report  PNG, Markdown
"""
