"""mycroft.rca_service"""
