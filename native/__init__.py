"""mycroft.native"""
