"""Agents and the devices they report."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from decodebench.contracts.names import DeviceStatus, Driver
from decodebench.contracts.profiles import UnknownDeviceClass, get_profile
from decodebench.contracts.protocol import AgentRegistration, DeviceInfo
from server import tenancy
from server.auth import AGENT_OF_TOKEN
from server.errors import Conflict, InvalidInput, NotAuthenticated
from server.models import Agent, ApiToken, Device


def register_agent(session: Session, token: ApiToken, registration: AgentRegistration) -> Agent:
    agent = session.scalar(select(Agent).where(Agent.token_id == token.id).with_for_update())
    now = datetime.now(UTC)
    if agent is None:
        agent = Agent(token_id=token.id, name=registration.name)
        session.add(agent)
    agent.name = registration.name
    agent.hostname = registration.hostname
    agent.version = registration.version
    agent.last_seen_at = now
    session.flush()
    sync_devices(session, agent, registration.devices)
    return agent


def agent_for_token(session: Session, token: ApiToken) -> Agent:
    agent = session.info.get(AGENT_OF_TOKEN)  # read with the token (server/auth.py)
    if agent is None or agent.token_id != token.id:
        agent = session.scalar(select(Agent).where(Agent.token_id == token.id))
    if agent is None:
        raise NotAuthenticated("this agent token has not registered; POST /api/v1/agents/register")
    return agent


def heartbeat(session: Session, agent: Agent, devices: list[DeviceInfo]) -> None:
    agent.last_seen_at = datetime.now(UTC)
    sync_devices(session, agent, devices)


def sync_devices(session: Session, agent: Agent, devices: list[DeviceInfo]) -> None:
    """The reported inventory is the truth: new devices appear, missing ones are disconnected."""
    udids = [device.udid for device in devices]
    if len(set(udids)) != len(udids):
        raise InvalidInput("devices: each udid may appear once")
    for info in devices:
        try:
            get_profile(info.device_class)
        except UnknownDeviceClass as error:
            raise InvalidInput(f"devices: {error}") from None
        if Driver(info.driver).fake_device and not info.simulated:
            raise InvalidInput(
                f"devices.{info.udid}.simulated: a {info.driver} device does not measure "
                "on hardware and must register with simulated: true"
            )
    now = datetime.now(UTC)
    # Locked up front, in id order as a batched claim locks them (server/runs/service.py):
    # updated in whatever order the statements below take them, they deadlocked with claims.
    existing = {
        device.udid: device
        for device in session.scalars(
            select(Device)
            .where(Device.udid.in_(udids) | (Device.agent_id == agent.id))
            .order_by(Device.id)
            .with_for_update()
        )
    }
    unchanged = []
    for info in devices:
        device = existing.get(info.udid)
        if device is None:
            device = Device(udid=info.udid, agent_id=agent.id)
            session.add(device)
        elif device.agent_id != agent.id and device.connected:
            raise Conflict(f"device {info.udid} is connected to another agent")
        reported = _reported(agent, info)
        if all(getattr(device, name) == value for name, value in reported.items()):
            # A heartbeat mostly says "still here": those devices share one UPDATE below.
            unchanged.append(info.udid)
            continue
        for name, value in reported.items():
            setattr(device, name, value)
        device.last_seen_at = now
    if unchanged:
        session.execute(
            update(Device)
            .where(Device.udid.in_(unchanged))
            .values(last_seen_at=now)
            .execution_options(synchronize_session=False)
        )
    for udid, device in existing.items():
        if udid not in udids and device.agent_id == agent.id:
            device.connected = False
            device.status = DeviceStatus.disconnected
            device.status_detail = ""


def _reported(agent: Agent, info: DeviceInfo) -> dict[str, object]:
    return {
        "agent_id": agent.id,
        "device_class": info.device_class,
        "product_type": info.product_type,
        "os_version": info.os_version,
        "driver": info.driver,
        "simulated": info.simulated,
        "battery_level": info.battery_level,
        "charging": info.charging,
        "thermal_state": info.thermal_state.value,
        "status": info.status.value,
        "status_detail": info.status_detail,
        "failed_checks": [check.model_dump(mode="json") for check in info.failed_checks],
        "connected": True,
    }


def list_devices(session: Session) -> list[Device]:
    return list(
        session.scalars(
            select(Device)
            .where(tenancy.devices(session))
            .order_by(Device.device_class, Device.udid)
        )
    )
