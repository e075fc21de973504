"""Who may call and what a caller may hold: TLS, callers' identities and API keys
(credentials), bearer tokens for the control calls (bearer), and the calls a client may hold
open at a server (occupancy).
"""
