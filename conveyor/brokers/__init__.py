"""How messages move: one module per backend, all behind :class:`~conveyor.brokers.base.ConveyorBroker`.

The App (``conveyor/app.py``) builds the configured broker with its middleware and
declares the actors on it; a broker module knows neither the job types nor the App.
"""
