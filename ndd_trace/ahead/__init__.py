"""Running ahead: the rules by which DALI work runs before Python asks for it, reader streams and
the speculator that apply them.
"""
