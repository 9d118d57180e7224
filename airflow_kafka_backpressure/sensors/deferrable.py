"""What the provider's deferrable sensors share: check once in the worker, then hand the wait to a
:class:`~airflow_kafka_backpressure.triggers.polling.PollingTrigger` with the sensor's own deadline."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException


class DeferrablePollingSensor(BaseSensorOperator):
    """``deferrable=True`` frees the worker slot: :meth:`trigger` waits in the triggerer.

    Subclasses implement ``poke()``, :meth:`trigger`, :meth:`result` and :meth:`waiting_for`."""

    def __init__(self, *, deferrable: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deferrable = deferrable

    if TYPE_CHECKING:

        def poke(self, context: Context) -> PokeReturnValue: ...  # the subclasses' (not a bare bool)

    def trigger(self, deadline_ms: int | None) -> Any:
        raise NotImplementedError

    def result(self, event: dict[str, Any]) -> Any:
        """The task's return value (XCom) from the trigger's ``found`` event."""
        raise NotImplementedError

    def waiting_for(self) -> str:
        """Names what the sensor waits for, in timeout and error messages."""
        raise NotImplementedError

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        found = self.poke(context)
        if found.is_done:
            return found.xcom_value
        deadline_ms = int(time.time() * 1000 + float(self.timeout) * 1000) if self.timeout else None
        self.defer(trigger=self.trigger(deadline_ms), method_name="execute_complete")

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        if event and event.get("status") == "timeout":
            message = f"{self.waiting_for()}: nothing within {self.timeout}s"
            if self.soft_fail:
                raise AirflowSkipException(message)
            raise AirflowSensorTimeout(message)
        if not event or event.get("status") != "found":
            raise RuntimeError(
                f"{self.waiting_for()}: the trigger stopped: {(event or {}).get('message', 'no event')}"
            )
        return self.result(event)
