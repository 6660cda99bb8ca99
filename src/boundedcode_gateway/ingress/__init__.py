"""The HTTP surface: the route table, the checks every route makes, and one module per
surface (the fronts' calls, the models, the operator's endpoints, the page of calls).
Bad input becomes a 4xx in the caller's front's shape here.

It sends nothing to an upstream itself: a call goes through the service, and so does
the question of a profile's servers; readiness is asked through ``operations/``, and a
profile's capabilities of its adapter (which reads them once).
"""
