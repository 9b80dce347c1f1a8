"""The scheduler half: which chunks a request loads and stores, and when a job is done.

``connector.py`` (``SchedulerConnector``) is its entry point; it loops over the tiers' indexes
(``kvtier.tiers``) and names none.
"""
