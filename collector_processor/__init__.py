"""mycroft.collector_processor"""
